"""What runs cost, in one room: GPU instances and their prices (``instances``), whether a model fits one
(``sizing``), the batch APIs' prices for the same tokens (``prices``), what a run will cost before it runs
(``estimate``) and whether a job pays for its start-up (``lease``), what a run cost (``run_cost``), and the
figures a person reads (``report``, ``last_runs``)."""
