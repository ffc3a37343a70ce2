"""Lowering one stage (a compute and its schedule) to the loop IR, in parts:

- `axes`: the schedule's loops (splits, order, kinds), checked (`ScheduleError`); fusing the
  parallel loops into one.
- `tails`: what the loops of an axis do about a partial last block (`TailStrategy`: shrink,
  guard, peel), and the guards and clamps that follow.
- `packing`: operands repacked into panels before the main nest (`Schedule.pack`), or, for
  a large operand indexed by the outer batch loops, per batch element inside them.
- `reductions`: accumulators: where they start, their scope, initialisation, update and
  write-back.
- `stage`: `lower_stage`, the above put together.
- `horizontal`: independent stages of a group fused into one nest (after they are lowered).

Nothing here is CPU-specific: the result is loop IR (`nfc.codegen.loops`), which the LLVM
emitter renders and a GPU lowering can reuse. `nfc.codegen.lower` lowers whole kernels
(groups of stages, inlined producers, contraction views) through `lower_stage`.
"""
