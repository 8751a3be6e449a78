"""The command line: `mlxcel` and `mlxcel-server` (`main`), the serve flags (`flags`,
`flag_table`, `prompt_cache`), starting a server on a real model (`serve`) and `mlxcel codex-config`
(`codex`). Only the entry points import it."""
