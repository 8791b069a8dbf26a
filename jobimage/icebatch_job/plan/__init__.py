"""What a run reads: the source rows of its range, planned from the table's metadata, and the work left.

``source`` plans a range (the files and rows added past the watermark and still live at its end) and reads
it; ``identity`` names each row's content, so that rows rewritten without change are not labelled again and
verdicts of rows gone are removed; ``work`` puts both together with what earlier attempts committed.
"""
