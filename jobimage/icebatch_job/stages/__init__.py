"""The pipeline's stages, in the order rows go through them: prompts, the engine (in-process vLLM) or an
OpenAI-compatible endpoint, the engine's outputs, the parse into result rows; ``pipeline`` builds them into
one streaming Ray Data pipeline, and ``model`` says which model the engine loads.
"""
