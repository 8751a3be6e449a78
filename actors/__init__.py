"""The running tasks above the model and their messages: the scheduler (its control task
and slots), the requester's `ResponseStream`, the job supervisor, and the message
catalogue they speak. The model actor, which owns MLX, is `mlxcel.model.actor`; the store
is `mlxcel.store`; the response builder the slots feed is `mlxcel.respond`."""
