"""Comgra's tutorial network and training loop (``src/scripts/run.py`` of its repository), same shape, on
the Comgra layer: only the three import lines below differ from a script written for Comgra itself.

The task: a sequence of N steps of 5 numbers in [-1, 1]; the target says, for each of the 5 positions,
whether its sum over the sequence is positive. The model is recurrent: three sub-networks (``subnet_pre``,
``subnet_out``, ``subnet_mem``; Linear, LeakyReLU, Linear) read the step's input and the memory and
produce the output (through a sigmoid) and the next memory. Each sub-network registers its own tensors
through ``comgra.my_recorder``. Sequence lengths 1 to 10 train, 15 and 20 only test (no optimizer step);
the length is the step's type of execution (``05_iterations``), so each length gets recorded regularly.

The bug (``bugged_original_version``): every sub-network applies its LeakyReLU (slope 0.01) to its output
layer too, so the values fed to the sigmoid can hardly become negative and outputs for targets of 0 stay
near 0.5. The fix (``no_activation_function_on_output_layer``) leaves the output layers linear.

Recorded per step: the memory node with its initial value (``is_initial_value``) and each iteration's
value, a helper node with one role per partial sum (``helper_partial_sums``, roles ``final`` and
``up_to_iteration_NN``) linked to the input by ``add_tensor_connection``, the loss per sample, the loss,
gradients, KPIs (loss, accuracy) and notes. Summaries every step, snapshots as the decision maker says.

Run both trials into a group folder and open the GUI::

    python -m comgra_ndbg.compat.comgra.tutorial --path runs --group tutorial --steps 2000
    comgra-ndbg gui runs/tutorial

From Python: ``run(path, configuration="bugged_original_version", steps=2000)`` returns the trial folder.
"""
from __future__ import annotations

import argparse
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import comgra_ndbg.compat.comgra as comgra
from comgra_ndbg.compat.comgra.recorder import ComgraRecorder
from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsFrequencyPerType

__all__ = ["CONFIGURATIONS", "Demonstration", "run", "main", "source_for_comgra"]

LAYER_IMPORTS = ("import comgra_ndbg.compat.comgra as comgra",
                 "from comgra_ndbg.compat.comgra.recorder import ComgraRecorder",
                 "from comgra_ndbg.compat.comgra.objects import DecisionMakerForRecordingsFrequencyPerType")
COMGRA_IMPORTS = ("import comgra",
                  "from comgra.recorder import ComgraRecorder",
                  "from comgra.objects import DecisionMakerForRecordingsFrequencyPerType")

CONFIGURATIONS = ("bugged_original_version", "no_activation_function_on_output_layer")
TRAINING_LENGTHS = tuple(range(1, 11))
TEST_LENGTHS = (15, 20)
INPUT_SIZE, OUTPUT_SIZE = 5, 5


class NeuralNet(nn.Module):
    """Linear, LeakyReLU(0.01), Linear (and, in the bugged configuration, LeakyReLU again)."""

    def __init__(self, input_size: int, hidden_size: int, output_size: int, activation_on_output: bool) -> None:
        super().__init__()
        self.fnn1 = nn.Linear(input_size, hidden_size)
        self.activation = nn.LeakyReLU(negative_slope=0.01)
        self.fnn2 = nn.Linear(hidden_size, output_size)
        self.activation_on_output = activation_on_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activation(self.fnn1(x))
        # The same class is used three times: get_name_of_module gives each use its own tensor names.
        comgra.my_recorder.register_tensor(f"{comgra.my_recorder.get_name_of_module(self)}__hidden_state", x)
        x = self.fnn2(x)
        if self.activation_on_output:
            x = self.activation(x)
        comgra.my_recorder.register_tensor(f"{comgra.my_recorder.get_name_of_module(self)}__out", x)
        return x


class CompleteModule(nn.Module):
    """The recurrent cell: ``subnet_pre`` reads input and memory, ``subnet_out`` and ``subnet_mem`` read it."""

    def __init__(self, hidden_size: int, memory_size: int, activation_on_output: bool) -> None:
        super().__init__()
        self.subnet_pre = NeuralNet(INPUT_SIZE + memory_size, hidden_size, hidden_size, activation_on_output)
        self.subnet_out = NeuralNet(hidden_size, hidden_size, OUTPUT_SIZE, activation_on_output)
        self.subnet_mem = NeuralNet(hidden_size, hidden_size, memory_size, activation_on_output)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pre = self.subnet_pre(x)
        return self.subnet_out(pre), self.subnet_mem(pre)


class Demonstration:
    """Trains one configuration after another into ``comgra_root_path/comgra_group/trial_<configuration>``.

    ``recorder_options`` (not in Comgra) goes to ``ComgraRecorder``; ``comgra_is_active=False`` trains with
    the recorder off. Data come from a generator seeded with ``seed``, the weights from ``torch.manual_seed``.
    """

    def __init__(self, comgra_root_path: str | Path, comgra_group: str, *, steps: int = 2000, seed: int = 0,
                 batch_size: int = 128, hidden_size: int = 200, memory_size: int = 50, dataset_size: int = 10_000,
                 min_training_steps_difference: int = 1000, comgra_is_active: bool = True,
                 recorder_options: Mapping[str, Any] | None = None, verbose: bool = False) -> None:
        self.comgra_root_path = Path(comgra_root_path)
        self.comgra_group = comgra_group
        self.steps, self.seed, self.batch_size = steps, seed, batch_size
        self.hidden_size, self.memory_size = hidden_size, memory_size
        self.min_training_steps_difference = min_training_steps_difference
        self.comgra_is_active = comgra_is_active
        self.recorder_options = recorder_options
        self.verbose = verbose
        self.losses: dict[str, list[float]] = {}
        generator = torch.Generator().manual_seed(seed)
        self.task_data = []
        for length in TRAINING_LENGTHS + TEST_LENGTHS:
            inputs = torch.rand((dataset_size, length, INPUT_SIZE), generator=generator) * 2 - 1
            self.task_data.append((length, length in TRAINING_LENGTHS, inputs, (inputs.sum(dim=1) > 0.0).float()))

    def run_all_configurations(self, configurations: Sequence[str] = CONFIGURATIONS) -> list[Path]:
        """Train each configuration (a trial each) and return the trial folders."""
        return [self.run_configuration(configuration) for configuration in configurations]

    def run_configuration(self, configuration: str) -> Path:
        if configuration not in CONFIGURATIONS:
            raise ValueError(f"configuration must be one of {CONFIGURATIONS}, got {configuration!r}")
        torch.manual_seed(self.seed)
        self.model = CompleteModule(self.hidden_size, self.memory_size,
                                    activation_on_output=configuration == "bugged_original_version")
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.criterion = nn.MSELoss(reduction="none")  # per-sample losses, to record them
        self.configuration = configuration
        self.losses[configuration] = []
        extra = {"recorder_options": self.recorder_options} if self.recorder_options is not None else {}
        comgra.my_recorder = ComgraRecorder(
            comgra_root_path=self.comgra_root_path,
            group=self.comgra_group,
            trial_id=f"trial_{configuration}",
            decision_maker_for_recordings=DecisionMakerForRecordingsFrequencyPerType(
                min_training_steps_difference=self.min_training_steps_difference),
            prefixes_for_grouping_module_parameters_visually=[
                "root_module.subnet_pre", "root_module.subnet_out", "root_module.subnet_mem"],
            prefixes_for_grouping_module_parameters_in_nodes=["root_module.subnet_pre"],
            max_num_batch_size_to_record=5,
            comgra_is_active=self.comgra_is_active,
            calculate_svd_and_other_expensive_operations_of_parameters=True,
            **extra,
        )
        comgra.my_recorder.track_module("root_module", self.model)
        comgra.my_recorder.add_note(f"Configuration: {configuration}, {self.steps} steps")
        for i, (length, use_for_training, inputs, _) in enumerate(self.task_data):
            comgra.my_recorder.add_note(f"Dataset {i}: {length} iterations, used for training: {use_for_training}, "
                                        f"{len(inputs):,} sequences")
        sampler = torch.Generator().manual_seed(self.seed + 1)
        for training_step in range(self.steps):
            length, use_for_training, inputs, targets = self.task_data[training_step % len(self.task_data)]
            index = torch.randint(0, len(inputs), (self.batch_size,), generator=sampler)
            self.run_one_training_step(training_step, length, inputs[index], targets[index], use_for_training)
        comgra.my_recorder.finalize()
        return self.comgra_root_path / self.comgra_group / f"trial_{configuration}"

    def run_one_training_step(self, training_step: int, num_iterations: int, input_tensor: torch.Tensor,
                              target_tensor: torch.Tensor, update_the_model_parameters: bool) -> None:
        batch_size = self.batch_size
        comgra.my_recorder.start_batch(training_step, batch_size, type_of_execution=f"{num_iterations:02d}_iterations",
                                       record_all_tensors_per_batch_index_by_default=True,
                                       override__recording_is_active=None)
        memory = torch.zeros((batch_size, self.memory_size))
        comgra.my_recorder.register_tensor("initial_memory", memory, node_name="memory", is_initial_value=True)
        for iteration in range(num_iterations):
            input_for_this_iteration = input_tensor[:, iteration, :]
            comgra.my_recorder.start_iteration()
            comgra.my_recorder.register_tensor("input", input_for_this_iteration, is_input=True)
            x = torch.cat([input_for_this_iteration, memory], dim=1)
            output, memory = self.model(x)
            output = torch.sigmoid(output)
            comgra.my_recorder.register_tensor("output", output)
            comgra.my_recorder.register_tensor("memory_out", memory, node_name="memory")
            if iteration == num_iterations - 1:
                self._finish_sequence(training_step, num_iterations, input_tensor, input_for_this_iteration, output,
                                      target_tensor, update_the_model_parameters)
            comgra.my_recorder.finish_iteration()
        comgra.my_recorder.finish_batch()

    def _finish_sequence(self, training_step: int, num_iterations: int, input_tensor: torch.Tensor,
                         input_for_this_iteration: torch.Tensor, output: torch.Tensor, target_tensor: torch.Tensor,
                         update_the_model_parameters: bool) -> None:
        comgra.my_recorder.register_tensor("target", target_tensor, is_target=True)
        for i in range(num_iterations):  # helper values: one node, one role per partial sum
            helper_partial_sums = input_tensor[:, :i + 1, :].sum(dim=1).detach()
            comgra.my_recorder.register_tensor(
                f"helper_partial_sums_up_to_iteration_{i:02}", helper_partial_sums, node_name="helper_partial_sums",
                role_within_node="final" if i == num_iterations - 1 else f"up_to_iteration_{i:02}")
            comgra.my_recorder.add_tensor_connection(input_for_this_iteration, helper_partial_sums)
        loss_per_sample = self.criterion(output, target_tensor)
        comgra.my_recorder.register_tensor("loss_per_sample", loss_per_sample)
        loss = loss_per_sample.mean()
        comgra.my_recorder.register_tensor("loss", loss, is_loss=True)
        self.optimizer.zero_grad()
        loss.backward()
        accuracy = output.argmax(dim=1).eq(target_tensor.argmax(dim=1)).float().mean()
        accuracy_first_ten_samples = output[:10].argmax(dim=1).eq(target_tensor[:10].argmax(dim=1)).float().mean()
        comgra.my_recorder.record_kpi_in_graph("loss", "", loss, timepoint=training_step)
        comgra.my_recorder.record_kpi_in_graph("accuracy", "all", accuracy)
        comgra.my_recorder.record_kpi_in_graph("accuracy", "first_ten_samples", accuracy_first_ten_samples)
        if update_the_model_parameters:
            self.optimizer.step()
        comgra.my_recorder.record_current_gradients("gradients")
        self.losses[self.configuration].append(loss.item())
        if comgra.my_recorder.recording_is_active():
            note = (f"{self.configuration}, Step {training_step:5}: {num_iterations:2} iterations "
                    f"{'(training)' if update_the_model_parameters else ' (testing)'}  -  Loss = {loss.item():10.6f}"
                    f"  -  Accuracy on batch = {accuracy:2.3f}")
            if self.verbose:
                print(note, flush=True)
            comgra.my_recorder.add_note(note)


def run(path: str | Path, *, configuration: str = "bugged_original_version", steps: int = 2000,
        group: str = "tutorial", seed: int = 0, **options: Any) -> Path:
    """Train one configuration for ``steps`` steps into ``path/group/trial_<configuration>``; returns that
    folder. ``options`` are :class:`Demonstration`'s keyword arguments (sizes, decision maker's difference,
    ``recorder_options``)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    return Demonstration(path, group, steps=steps, seed=seed, **options).run_configuration(configuration)


def source_for_comgra() -> str:
    """This script's source with the three import lines Comgra itself needs: nothing else differs. Written
    to a file, it runs on Comgra 0.11.5 (``pip install comgra==0.11.5``) with the same arguments."""
    source = Path(__file__).read_text()
    for ours, theirs in zip(LAYER_IMPORTS, COMGRA_IMPORTS):
        if source.count(f"\n{ours}\n") != 1:
            raise RuntimeError(f"the tutorial's import line {ours!r} is not where source_for_comgra() expects it")
        source = source.replace(f"\n{ours}\n", f"\n{theirs}\n")
    return source


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Comgra's tutorial network, bugged and fixed, recorded.")
    parser.add_argument("--path", default="runs", help="root folder (Comgra's comgra_root_path)")
    parser.add_argument("--group", default="tutorial")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configurations", nargs="+", default=list(CONFIGURATIONS), choices=CONFIGURATIONS)
    parser.add_argument("--min-training-steps-difference", type=int, default=1000)
    parser.add_argument("--inactive", action="store_true", help="train with comgra_is_active=False")
    args = parser.parse_args(argv)
    path = Path(args.path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path / args.group, ignore_errors=True)
    demonstration = Demonstration(path, args.group, steps=args.steps, seed=args.seed,
                                  min_training_steps_difference=args.min_training_steps_difference,
                                  comgra_is_active=not args.inactive, verbose=True)
    for trial in demonstration.run_all_configurations(args.configurations):
        print(f"recorded {trial}", flush=True)


if __name__ == "__main__":
    main()
