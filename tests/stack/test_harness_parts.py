"""The chaos run and the simulation are objects composed of their parts (issue 36, item 2): each
given the stack it runs against, the lab's runs the same objects with the lab's stack. Built here
without starting anything (a stack starts in `start`)."""

from __future__ import annotations

import io

from harness.chaos.driver import Chaos
from harness.chaos.faults import Faults
from harness.lab.bank import LabRun
from harness.lab.fault import LabStack
from harness.private import PrivateStack, Stack
from harness.simulation.driver import Simulation
from harness.simulation.faults import Faults as SimulationFaults
from harness.simulation.lab import LabFaults, LabSimulation


def test_the_chaos_run_is_given_its_stack_and_the_lab_run_holds_one_on_the_lab(tmp_path):
    chaos = Chaos(7, io.StringIO(), PrivateStack(tmp_path))
    assert isinstance(chaos.stack, Stack)
    assert chaos.record.seed == 7
    assert chaos.record.answers == []
    assert chaos.record.faults == []
    assert chaos.make_faults is Faults
    assert chaos.load is None

    run = LabRun(8, io.StringIO(), tmp_path, on_app_hosts=True)
    assert isinstance(run.chaos, Chaos)
    assert run.chaos.stack is run.stack
    assert isinstance(run.stack, LabStack)
    assert run.stack.on_app_hosts
    assert run.stack.stack_dir == LabRun.STACK_DIR
    assert run.chaos.make_faults is None  # the lab's fault comes from harness/lab/faults.py
    assert run.answers is run.record.answers
    assert run.segments is run.record.segments
    assert not LabRun(9, io.StringIO(), tmp_path).stack.on_app_hosts
    # Objects with parts, not piles of mixins sharing `self`.
    for cls in (Chaos, LabRun, PrivateStack, LabStack, Simulation):
        assert all(base in (cls, Stack, object) for base in cls.__mro__), cls.__mro__


def test_the_lab_simulation_is_the_simulation_with_the_lab_stack_and_faults(tmp_path):
    sim = Simulation(3, 1.0, 2, io.StringIO())
    assert isinstance(sim.new_stack(tmp_path), PrivateStack)
    lab = LabSimulation(3, 1.0, 2, io.StringIO())
    stack = lab.new_stack(tmp_path)
    assert isinstance(stack, LabStack)
    assert stack.on_app_hosts
    assert LabSimulation.__mro__ == (LabSimulation, Simulation, object)
    assert LabFaults.__mro__ == (LabFaults, SimulationFaults, object)
    assert lab.fault_plan != sim.fault_plan  # the lab's plan, drawn from its own catalogue
