"""The prompt cache: KV states of prompts already read, kept for the next request that
starts the same way: in memory (`prefix.py`), and on disk behind it (`disk.py`, with one
file's format in `spill_file.py`, what a file must be for this model in `layout.py`, and
the tier's private folders and files in `private.py`)."""
