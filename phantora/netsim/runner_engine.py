"""netsim's packet engine without the Python bindings: `phantora-ns3-runner --records` runs the call script.

Importing ns-3 into Python (`from ns import ns`, cppyy) takes seconds; the compiled runner starts in
milliseconds. `RunnerNetwork` writes the run's PhantoraNetwork calls as `Ns3Simulator` would make them (the
script `netsim --out` keeps as ns3-calls.txt), with the same checks first; the runner makes those calls, runs
as netsim drives the in-process engine (the same run calls, so the same events) and prints every record,
parsed back by `runner_records`. FCTs, traces and counters are identical to the in-process engine's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from phantora.errors import InputError, PhantoraError
from phantora.netsim import cc_registry, ns3_abi, ns3_build
from phantora.netsim.base import CausalityError, Flow
from phantora.netsim.ns3_calls import RecordedNetwork
from phantora.netsim.packet import check_packet_batch, finalize_field, ns3_key
from phantora.netsim.packet_config import PacketConfig, field_of_param
from phantora.netsim.proc_watch import watched_lines
from phantora.netsim.runner_records import OnEffective, RecordParser, RunnerRecords, Tick
from phantora.topology.model import Topology

ENGINE_ENV = "PHANTORA_NETSIM_ENGINE"  # "inprocess": netsim loads the bindings as before (for comparisons)
_FLOW_CALLS = ("AddFlow", "SetLossBudget", "SetMaxRate", "SetConnection")


def runner_usable(config: PacketConfig) -> bool:
    """True if netsim can run `config` in the runner: the default, unless $PHANTORA_NETSIM_ENGINE=inprocess, a
    library of one's own ($PHANTORA_NS3_LIB) has no runner of its build to run it (`own_library_runs`) or the
    config wraps the engine in Python (nic_latency, workers)."""
    if os.environ.get(ENGINE_ENV, "runner") == "inprocess" or not own_library_runs():
        return False
    return not (config.nic_latency or config.workers)


def own_library_runs() -> bool:
    """Whether the runner would run the library $PHANTORA_NS3_LIB names (True without it): the runner beside it
    loads `libphantora-ns3.so` from its own folder (the Makefile links it with rpath $ORIGIN), so only a library of
    that name with `phantora-ns3-runner` beside it. A runner older than the library's interface is refused in one
    line before the run (`ns3_abi.check_runner`; it predates --records too), as the library itself would be
    in-process; another name, or no runner, runs in-process."""
    own = os.environ.get(ns3_abi.LIB_ENV)
    if not own:
        return True
    lib = Path(own)
    return lib.name == ns3_build.LIBRARY_NAME and ns3_build.runner_path().exists()


class _ScriptOnly:
    """A PhantoraNetwork stand-in whose calls do nothing: under a RecordedNetwork, only the script is written."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


class RunnerNetwork:
    """A packet run as a call script (`build`, `submit`), then `run` in phantora-ns3-runner."""

    def __init__(self, topology: Topology, config: PacketConfig, script: Path) -> None:
        """Check `config` as `Ns3Simulator` does and write the fabric's calls to `script`."""
        config = config.validate()
        topology.use_ecmp(config.ecmp_hash or topology.ecmp_hash)
        self.topology = topology
        self.config = config.with_updates(ecmp_hash=topology.ecmp_hash)
        if ns3_build.needs_build():
            ns3_build.build()
        ns3_abi.check_runner(ns3_build.runner_path())
        extra = ns3_build.cc_library()
        cc_registry.check(self.config.cc, self.config.cc_attrs)
        self.script = script
        self._net = RecordedNetwork(_ScriptOnly(), script, libraries=[extra] if extra else [])
        self._known: set[int] = set()
        self._tags: dict[int, str] = {}
        net = self._net
        for key, value in self.config.to_params(link.bandwidth_bps for link in topology.links):
            net.SetParam(key, value)
        for node in topology.nodes:
            net.AddNode(node.kind)
        for link in topology.links:
            net.AddLink(link.a, link.b, link.bandwidth_bps, link.latency_ns)
        net.Finalize()

    def submit(self, flows: Sequence[Flow], at: int, dports: Mapping[int, int] | None = None) -> None:
        """`Ns3Simulator.submit` before the run: flows eligible from `at`, checked the same way."""
        if at < 0:  # now() is 0 until the run
            raise CausalityError(f"flows submitted at {at} ns but the network is already at 0 ns")
        check_packet_batch(flows, self.topology, self._known.__contains__)
        for f in flows:
            key = ns3_key(f)
            dport = dports.get(f.id, 100) if dports else 100
            self._net.AddFlow(
                f.id, f.src, f.dst, f.size, at, f.priority, key, list(f.deps), f.delay_ns, dport, f.via_nic
            )
            if f.loss_budget:
                self._net.SetLossBudget(f.id, f.loss_budget)
            if f.rate_bps:
                self._net.SetMaxRate(f.id, f.rate_bps)
            if f.conn and self.config.qp == "connection":
                self._net.SetConnection(f.id, f.conn)
            if f.queue:
                self._net.SetQueue(f.id, f.queue)
            self._known.add(f.id)
            if f.tag:
                self._tags[f.id] = f.tag

    def run(
        self, watch: Sequence[int] = (), tick: Tick | None = None, on_effective: OnEffective | None = None
    ) -> RunnerRecords:
        """Run the script until every flow is acknowledged; `watch`: flows to stop at for `tick` (progress);
        `on_effective`: given what the fabric runs by (`EffectiveParams` pairs) before the run goes on."""
        self._net.Close()
        cmd = [str(ns3_build.runner_path()), "--records"]
        cmd += ["--watch", ",".join(str(i) for i in watch)] if watch else []
        parser = RecordParser(self._tags, tick, on_effective)
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen([*cmd, str(self.script)], stdout=subprocess.PIPE, stderr=err, text=True)
            try:
                assert proc.stdout is not None
                for line in watched_lines(proc, "the ns-3 runner"):  # one stopped for good ends the run (proc_watch)
                    parser.feed(line)
                code = proc.wait()
            finally:
                if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): stop the runner too
                    proc.kill()
                    proc.wait()
            err.seek(0)
            self._raise_for(code, err.read(), parser.records)
        return parser.records

    def _raise_for(self, code: int, stderr: str, records: RunnerRecords) -> None:
        """The error of a failed run, as the in-process engine raises it (InputError naming the field of a bad call)."""
        if records.stuck is not None:
            raise PhantoraError(f"{records.stuck[0]} flows can never start: they wait on flows that never complete")
        if code == 0 and records.ended:
            return
        prefix = f"phantora-ns3-runner: error: {self.script}:"
        for line in stderr.splitlines():
            if line.startswith(prefix):
                number, _, message = line[len(prefix) :].partition(": ")
                raise self._call_error(int(number), message)
        why = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {code}"
        raise PhantoraError(f"the ns-3 runner failed ({' '.join([str(ns3_build.runner_path()), '--records'])}): {why}")

    def _call_error(self, number: int, message: str) -> PhantoraError:
        """The error of the script's line `number`, with the PacketConfig field the call came from."""
        words = self.script.read_text(encoding="utf-8").splitlines()[number - 1].split()
        verb = words[0] if words else ""
        if verb == "SetParam":
            return InputError(message, field=field_of_param(words[1]))
        if verb == "Finalize":
            return InputError(message, field=finalize_field(message))
        if verb in _FLOW_CALLS:
            return InputError(message, field="flows")
        return PhantoraError(f"the ns-3 network: {message}")
