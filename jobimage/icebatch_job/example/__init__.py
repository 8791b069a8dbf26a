"""The running example, and nothing else depends on it: support tickets (a generator and the source table)
and the tiny random-weight Llama the embedded default runs when no model is configured."""
