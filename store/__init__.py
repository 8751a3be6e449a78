"""What the server keeps, where, and for how long: the store actor and its handle, the
tables and their limits, the backends (memory, SQLite, Redis) and the rules they share,
the item index, the reasoning-echo table and this replica's lease on a shared store.
The store imports nothing above the vocabulary."""
