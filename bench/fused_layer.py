"""A decode step's time, per layer form, on the real model: interleaved, in one process.

For each batch size M it builds identical decode states (M rows at ~150 tokens of context)
and times greedy decode steps, rotating between the forms so that a noisy machine slows
them alike:

- ``model``: mlx-lm's own forward (what a decode batch alone ran before the fused layers);
- ``composed``: the flattened forward on mlx-lm's modules (``MLXCEL_FUSED_LAYER=0``);
- ``compiled``: the same, each layer's norm + QKV and its o_proj + residual + norm + MLP +
  residual under ``mx.compile`` (the cheap experiment the fused layer was measured against);
- ``fused``: the flattened forward with the fused head and tail (the default on the CPU).

Prints each form's median step in ms, and how many greedy tokens the fused form shares
with the composed one. Asserts nothing. On a machine other jobs load, ``--cpu-time`` times
the CPU the process spends instead of the wall clock (run it with ``MLXCEL_CPU_THREADS=1``
and ``MLXCEL_CPU_SPIN_US=1`` so that no worker spins): the work a step costs, whatever
share of the cores the process gets.

    .venv/bin/python bench/fused_layer.py [--levels 1,8] [--steps 40] [--cpu-time]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from mlxcel.model.native.blas import describe, load_fast_blas
from mlxcel.model.native.build import probe
from mlxcel.model.provision.fetch import default_model_dir

CONTEXT = 150
FORMS = ("model", "composed", "compiled", "fused")


def decode_state(model: Any, rows: int) -> Any:
    """A decode state of `rows` rows at about `CONTEXT` tokens each."""
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcel.model import forward

    lengths = [CONTEXT - i % 7 for i in range(rows)]
    tokens = [[(31 * i + 7 * j) % 1000 for j in range(n)] for i, n in enumerate(lengths)]
    caches = [make_prompt_cache(model) for _ in lengths]
    states, _ = forward.read_chunk(model, tokens, caches, [False] * rows)
    return forward.merge(states) if rows > 1 else states[0]


def compiled_layers(model: Any) -> Callable[..., Any]:
    """`step_logits` of the flattened forward with each layer's parts under `mx.compile`."""
    import mlx.core as mx

    from mlxcel.model import flat_forward

    parts = []
    for layer in model.model.layers:
        attn = layer.self_attn

        def head(h: Any, layer: Any = layer, attn: Any = attn) -> Any:
            x = layer.input_layernorm(h)
            return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

        def tail(h: Any, a: Any, layer: Any = layer, attn: Any = attn) -> Any:
            h = h + attn.o_proj(a)
            return h + layer.mlp(layer.post_attention_layernorm(h))

        parts.append((mx.compile(head), mx.compile(tail)))

    def step(groups: list[Any]) -> Any:
        (group,) = groups
        rows = len(group.tokens)
        h = model.model.embed_tokens(mx.array(group.tokens, dtype=mx.uint32)).reshape(1, rows, -1)
        mask = flat_forward.create_attention_mask(h.reshape(rows, 1, -1), group.cache[0])
        for index, layer in enumerate(model.model.layers):
            head, tail = parts[index]
            q, k, v = head(h)
            h = tail(h, flat_forward._attend(layer.self_attn, q, k, v, group, index, mask))
        head_of = flat_forward.head_of(model)
        assert head_of is not None
        return head_of(model.model.norm(h))[0]

    return step


def step_fn(model: Any, form: str) -> Callable[[list[int], Any], Any]:
    """One decode step's logits `[M, V]` in `form`, from the rows' last tokens and state."""
    from mlxcel.model import flat_forward, forward
    from mlxcel.model.native.fused_layer import plan_layers

    fused = plan_layers(model) if form == "fused" else None
    compiled = compiled_layers(model) if form == "compiled" else None

    def step(tokens: list[int], state: Any) -> Any:
        if form == "model":
            return forward.decode_logits(model, tokens, state)
        group = flat_forward.Group(
            [[t] for t in tokens], state, [(i, 0) for i in range(len(tokens))]
        )
        if compiled is not None:
            return compiled([group])
        return flat_forward.step_logits(model, [group], fused)[0]

    return step


def level(model: Any, rows: int, steps: int, clock: Callable[[], float]) -> None:
    import mlx.core as mx

    forms = {form: step_fn(model, form) for form in FORMS}
    states = {form: decode_state(model, rows) for form in FORMS}
    tokens = {form: [1] * rows for form in FORMS}
    times: dict[str, list[float]] = {form: [] for form in FORMS}
    same = total = 0
    for n in range(steps + 2):
        order = FORMS if n % 2 else FORMS[::-1]
        for form in order:
            started = clock()
            chosen = mx.argmax(forms[form](tokens[form], states[form]), axis=-1)
            mx.eval(chosen)
            if n >= 2:  # the first steps compile and warm up
                times[form].append(clock() - started)
            tokens[form] = chosen.tolist()
        same += sum(a == b for a, b in zip(tokens["fused"], tokens["composed"], strict=True))
        total += rows
    cells = " | ".join(f"{statistics.median(times[f]) * 1e3:.1f}" for f in FORMS)
    print(f"| {rows} | {cells} | {same}/{total} |", flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", default="1,8")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--cpu-time", action="store_true", help="time the process's CPU, not the wall")
    args = p.parse_args(argv)
    clock = time.process_time if args.cpu_time else time.perf_counter
    blas = load_fast_blas()
    from mlx_lm.utils import load

    from mlxcel.model.native.cpu_forms import install_cpu_forms
    from mlxcel.model.native.qmm import install_quantized_forms

    model = load(str(default_model_dir()))[0]
    install_cpu_forms(model)
    install_quantized_forms(model)
    what = "CPU time" if args.cpu_time else "wall clock"
    print(f"{probe().describe()}; {describe(blas)}; decode rows at ~{CONTEXT} tokens; {what}")
    print(f"| M | {' ms | '.join(FORMS)} ms | fused = composed tokens |")
    print("|---:|" + "---:|" * (len(FORMS) + 1))
    for rows in (int(x) for x in args.levels.split(",")):
        level(model, rows, args.steps, clock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
