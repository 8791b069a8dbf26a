"""What a run writes: result rows, committed chunk by chunk with the run's progress, and what is done.

``results`` (the results table's rows and data files), ``chunks`` (a chunk per ledger commit, the last one
moving the watermark), ``done`` (which source rows earlier attempts committed), ``window`` (the rows at risk:
released to the engine and not yet committed, never more than a chunk).
"""
