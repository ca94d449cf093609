"""The run directory's schema: its file names, each file's schema id and each CSV's columns, defined once.

Every JSON document a producer writes carries `"schema": "<id>/<version>"`; the reader dispatches on it
(directories written before the ids existed are recognised by their keys, see `phantora.results.read`).
"""

from __future__ import annotations

# JSON documents and their schema ids.
RESULTS_JSON = "results.json"  # one of RUN, REPLAY, EGRAPH_REPLAY
COSIM_JSON = "cosim.json"  # the bridge's summary of a co-simulated run
SUMMARY_JSON = "summary.json"  # `phantora netsim` engine counters
RUN = "phantora.run/1"
REPLAY = "phantora.replay/1"
EGRAPH_REPLAY = "phantora.egraph-replay/1"
COSIM = "phantora.cosim/1"
NETSIM = "phantora.netsim/1"

# The run's progress: status.json (running, complete, failed), steps.jsonl (one line per finished step),
# merged from steps/rank<R>.jsonl, which the live ranks append to as they go (phantora.results.run_dir).
STATUS_JSON = "status.json"
STATUS = "phantora.status/1"
STEPS_JSONL = "steps.jsonl"
STEPS_DIR = "steps"

# A run of several jobs (phantora.jobs): results.json is JOBS; each job's own run directory is jobs/<name>/,
# and with --alone its run by itself is alone/<name>/.
JOBS = "phantora.jobs/1"
JOBS_DIR = "jobs"
ALONE_DIR = "alone"
LINKS_BY_JOB_CSV = "links_by_job.csv"  # bytes of each job on each directed link

# CSV tables.
FLOWS_CSV = "flows.csv"  # one row per flow of a replay or a live run
FCT_CSV = "fct.csv"  # one row per flow of `phantora netsim`
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

FLOWS_COLUMNS = ("flow_id", "tag", "src", "dst", "size_bytes", "start_ns", "end_ns", "fct_ns", "standalone_fct_ns")
FCT_COLUMNS: tuple[str, ...] = ("flow_id", "src", "dst", "size", "priority", "start_ns", "end_ns", "fct_ns")
FCT_COLUMNS += ("standalone_ns", "slowdown", "cnps", "ecn_marks", "tag")
LINK_COLUMNS = ("channel", "link", "from", "to", "bandwidth_bps", "bytes", "utilisation")
LINKS_BY_JOB_COLUMNS = LINK_COLUMNS[:5] + ("job",) + LINK_COLUMNS[5:]
NETSIM_LINK_COLUMNS = ("channel", "src", "dst", "bandwidth_bps", "bytes", "utilisation")
LINK_EXTRA_COLUMNS = ("packets", "paused_ns", "ecn_marks", "max_queue_bytes")  # the packet engine's counters
PFC_COLUMNS = ("time_ns", "node", "node_type", "port", "prio", "pause", "from_node")
QUEUE_COLUMNS = ("time_ns", "node", "port", "prio", "bytes")
DROP_COLUMNS = ("time_ns", "node", "port", "prio", "flow_id", "seq")
CNP_COLUMNS = ("time_ns", "node", "flow_id", "from_node", "seq")
ECN_COLUMNS = ("time_ns", "node", "port", "prio", "channel", "flow_id")
