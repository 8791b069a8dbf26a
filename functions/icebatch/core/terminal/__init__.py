"""What a person at a terminal gets from both command lines (``icebatch`` and ``python -m icebatch_job``): their
shared promises (``command_line``), icebatch's own lines apart from libraries' logs (``console``), and ``--json``
meaning exactly one JSON document on stdout (``json_stdout``)."""
