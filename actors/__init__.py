"""The actors above the model: the scheduler (its slots, the `ResponseBuilder` they feed,
and the requester's `ResponseStream`), the job supervisor, the store and the
reasoning-echo cache, and the message catalogue they all speak. The model actor, which
owns MLX, is `mlxcel.model.actor`."""
