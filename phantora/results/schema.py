"""The run directory's schema: its file names, each file's schema id and each CSV's columns, defined once.

Every JSON document a producer writes carries `"schema": "<id>/<version>"`; the reader dispatches on it
(directories written before the ids existed are recognised by their keys, see `phantora.results.read`).
"""

from __future__ import annotations

# JSON documents and their schema ids.
RESULTS_JSON = "results.json"  # one of RUN, REPLAY, EGRAPH_REPLAY, JOBS, NCCL_TESTS
COSIM_JSON = "cosim.json"  # the bridge's summary of a co-simulated run
SUMMARY_JSON = "summary.json"  # `phantora netsim` engine counters
RUN = "phantora.run/1"
REPLAY = "phantora.replay/1"
EGRAPH_REPLAY = "phantora.egraph-replay/1"
COSIM = "phantora.cosim/1"
NETSIM = "phantora.netsim/1"
NCCL_TESTS = "phantora.nccl-tests/1"  # results.json of `phantora nccl-tests`: one record per size
NCCL_TESTS_TXT = "nccl-tests.txt"  # its table, in nccl-tests' own format
# What the packet engine ran by (issue 35): the EngineSpec as the command line built it, and for every
# PacketConfig field the ns-3 attribute(s) it became with the value ns-3 reports holding, every attribute read back
# and what the fabric-scaled defaults resolved to (phantora.netsim.effective). Written with the packet traces.
ENGINE_JSON = "engine.json"
ENGINE = "phantora.engine/1"

# The run's progress: status.json (running, complete, failed), steps.jsonl (one line per finished step),
# merged from steps/rank<R>.jsonl, which the live ranks append to as they go (phantora.results.run_dir).
STATUS_JSON = "status.json"
STATUS = "phantora.status/1"
STEPS_JSONL = "steps.jsonl"
STEPS_DIR = "steps"
# The run's configuration (phantora.results.provenance), and a seed group's list of runs (`--seeds N`).
CONFIG_JSON = "config.json"
SEEDS_JSON = "seeds.json"
SEEDS = "phantora.seeds/1"
# The Chrome trace: trace/rank<R>.jsonl, one line per finished step ({"rank", "step", "comm", "events"}: the
# collective spans apart from the rest; step None for the events after the last step), which the live ranks append
# to as they go, merged into trace.json as a stream (results/trace_chunks.py).
TRACE_JSON = "trace.json"
TRACE_DIR = "trace"
RUN_LOG = "run.log"  # a sweep's run: its command line, stdout and stderr (phantora.sweep_local)
SWEEP_RUN_JSON = "sweep-run.json"  # a sweep's run: its command and outcome, which a resumed sweep trusts
SCENARIO_STEPS_PNG = "scenario_steps.png"  # a scenario's plot: step (or op) time against simulated time, events
SCENARIO_STEPS_SVG = "scenario_steps.svg"  # marked (phantora.report.scenario_plot)
LOGS_DIR = "logs"  # the processes' logs: rank<R>.log (<job>.rank<R>.log), coordinator.log, server.log ...

# A run of several jobs (phantora.jobs): results.json is JOBS; each job's own run directory is jobs/<name>/,
# and with --alone its run by itself is alone/<name>/.
JOBS = "phantora.jobs/1"
JOBS_DIR = "jobs"
ALONE_DIR = "alone"
LINKS_BY_JOB_CSV = "links_by_job.csv"  # bytes of each job on each directed link

# CSV tables: the same files with the same columns from every producer (`run`, `replay` of a workload or of a
# recorded graph, `netsim`, the network server of a live run). Nodes are named as the topology names them
# (`phantora topo --json` lists names and ids); the ids stay in the *_id columns. A file the engine cannot
# measure is not written (the flow engine writes flows.csv and links.csv only): absent means "not measured".
FLOWS_CSV = "flows.csv"  # one row per flow
FCT_CSV = "fct.csv"  # read only: what `phantora netsim` wrote before flows.csv (size, standalone_ns, numeric ids)
LINKS_CSV = "links.csv"
PFC_CSV = "pfc.csv"
QUEUES_CSV = "queues.csv"
DROPS_CSV = "drops.csv"
CNPS_CSV = "cnps.csv"
ECN_CSV = "ecn_marks.csv"
# HPCC-format text files of `phantora netsim`, and its call script for ns3-scratch/build/phantora-ns3-runner.
FCT_TXT = "fct.txt"
PFC_TXT = "pfc.txt"
NS3_CALLS_TXT = "ns3-calls.txt"

# flows.csv: slowdown = fct_ns / standalone_fct_ns; priority, cnps and ecn_marks are empty where not known.
FLOWS_COLUMNS: tuple[str, ...] = (
    "flow_id",
    "tag",
    "src",
    "dst",
    "src_id",
    "dst_id",
    "size_bytes",
    "priority",
    "start_ns",
    "end_ns",
)
FLOWS_COLUMNS += ("fct_ns", "standalone_fct_ns", "slowdown", "cnps", "ecn_marks")
# The packet engine's transport counters (empty where not measured): data packets (and their payload bytes) sent
# again, packets that arrived with a hole before them, and the furthest one arrived ahead of the first missing byte.
FLOWS_COLUMNS += ("retx_packets", "retx_bytes", "ooo_packets", "reorder_max_bytes")
# The flow's own rate cap (payload bits/s, 0: none; empty where not known), which its standalone FCT takes.
FLOWS_COLUMNS += ("rate_cap_bps",)
# 1: the flow went through its hosts' NVSwitch alone (NVLink); 0: it left through the NICs (a fabric switch, a PCIe
# switch or a direct link); empty in files written before 2026-12-06.
FLOWS_COLUMNS += ("nvlink",)
# links.csv: one row per directed channel that carried traffic; the last four are the packet engine's counters.
LINK_EXTRA_COLUMNS = ("packets", "paused_ns", "ecn_marks", "max_queue_bytes")
LINK_COLUMNS: tuple[str, ...] = (
    "channel",
    "link",
    "from",
    "to",
    "from_id",
    "to_id",
    "bandwidth_bps",
    "bytes",
    "utilisation",
)
LINK_COLUMNS += LINK_EXTRA_COLUMNS
# links_by_job.csv: links.csv's first seven columns, the job, then its bytes and utilisation (phantora run --jobs)
_BYTES = LINK_COLUMNS.index("bytes")
LINKS_BY_JOB_COLUMNS = (*LINK_COLUMNS[:_BYTES], "job", "bytes", "utilisation")
# The packet engine's traces. `port` is the node's 0-based port, `peer` the node at the port's other end.
PFC_COLUMNS = ("time_ns", "node", "node_id", "node_type", "port", "prio", "pause", "from_node", "from_node_id")
QUEUE_COLUMNS = ("time_ns", "node", "node_id", "port", "peer", "prio", "bytes")
DROP_COLUMNS = ("time_ns", "node", "node_id", "port", "prio", "flow_id", "seq")
CNP_COLUMNS = ("time_ns", "node", "node_id", "flow_id", "from_node", "from_node_id", "seq")
ECN_COLUMNS = ("time_ns", "node", "node_id", "port", "prio", "channel", "flow_id")
