"""Route families: one package per API dialect (openai, anthropic, ollama, responses).

A family parses its bodies into prompt preparations and sampling settings,
formats results through a :class:`~flare.server.generation.GenerationFormat`,
and renders errors in its own shape (an ``app.ErrorRenderer`` given to every
route it adds). Its package exposes ``install(router, state)``, listed in
``session.FAMILIES``; the generation pipeline itself is shared
(server/generation.py).
"""
