"""Preparation: from a request's parameters to a `GenerationRequest`.

History and chains, reasoning echo, tools and grammars, early limits, rendering and
compaction planning. Free of any one wire format, so every HTTP API can reuse it: each
route enters through `front.py`, one call per kind of request.
"""
