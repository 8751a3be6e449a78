"""Constrained decoding: grammars enforced on the logits (`constrained.py`: JSON schemas
and the reply grammar of a forced tool call), the grammars of custom tools' calls
(`tool_grammars.py`), and the JSON quoting that carries a grammar inside a call's JSON
string (`json_quote.py`)."""
