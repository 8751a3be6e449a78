"""The greedy-parity prompts: four lengths, the last longer than a small prefill cap.

Shared by the engine's parity test (our engine against mlx-lm's batching) and the
conversion's (the quantized folder against the float32 one).
"""

SYSTEM = "Be brief."
"""A short system message: the template's default one would double every prompt."""

TEXTS = (
    "Say hi.",
    "Write a Python function that returns the squares of a list.",
    "Explain in two sentences what a hash map is and when a sorted list is better.",
    "Review this code and list its bugs: "
    + " ".join(f"def f{i}(x): return x * {i} if x > {i} else None;" for i in range(3)),
)
