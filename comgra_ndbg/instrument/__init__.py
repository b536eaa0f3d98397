"""Non-invasive instrumentation: what ``NeuralDbg`` puts into a model and a training loop it does not own.

Each module holds one concept; ``comgra_ndbg.neuraldbg.NeuralDbg`` composes them:

- :mod:`~comgra_ndbg.instrument.hooks`: forward hooks on chosen modules, eager and inside ``torch.compile``
  regions (the ``grad_tap`` custom op), and the names of what they see;
- :mod:`~comgra_ndbg.instrument.steps`: where a training step and its forward passes (iterations) begin
  and end, seen from the model's own pre- and post-forward hooks, the backward pass and the optimizer;
- :mod:`~comgra_ndbg.instrument.outputs`: registering module outputs, the model's input and output, and
  their gradients with the recorder;
- :mod:`~comgra_ndbg.instrument.loss`: the loss node and the ``loss`` KPI;
- :mod:`~comgra_ndbg.instrument.patches`: what is process-wide (``torch.autograd.backward``,
  ``GradScaler.scale``, the global optimizer step hooks), installed with the first open ``NeuralDbg``;
- :mod:`~comgra_ndbg.instrument.structure`: the structure pass, for passes whose edges autograd hides
  (compiled, frozen, checkpointed, autocast);
- :mod:`~comgra_ndbg.instrument.checkpoint`: gradients inside reentrant checkpoint segments;
- :mod:`~comgra_ndbg.instrument.compile_cache`: compiled code traced without the hooks, dropped.
- :mod:`~comgra_ndbg.instrument.breakpoints`: ``break_at``, ``step_through`` and ``on``: stopping inside the
  loop, or calling the user's code there, with what was recorded (conditions in
  :mod:`~comgra_ndbg.instrument.conditions`);
- :mod:`~comgra_ndbg.instrument.halting`: stopping a failed run when a halting flight-recorder trigger fires.

Everything here is installed by ``NeuralDbg`` and removed by its ``close()`` (the process-wide part by the
last open instance's).
"""
