"""Real local services and helpers shared by the tests."""
