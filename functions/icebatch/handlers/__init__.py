"""Lambda entry points: thin handlers that parse an event, call one function and return."""
