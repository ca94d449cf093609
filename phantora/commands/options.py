"""The options `run`, `replay`, `netsim` and `sweep` share, defined once: the same names, defaults, checks and help.

- `--network flow|ns3` (default flow everywhere), `--cc` (a registered CC, checked against the library's
  registry when the run starts: `phantora cc` lists them), `--set FIELD=VALUE` (its help lists the fields):
  `add_network_options`; `sweep` takes comma-separated lists of each.
- `--progress/--no-progress` and `--quiet`: `add_progress_options`, read back by `progress_mode`.
- `--no-plots` and `--plot-style default|paper`: `add_plot_options` (compare, sweep).
- `--granularity coarse|chunked`: the collectives' flows (run, replay, nccl-tests): `add_granularity_option`.
- `Parser`: the argparse parser of `phantora` and its commands, which names an unknown option and the known
  one nearest to it ("unknown option --topolgy; did you mean --topology?").
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

from phantora.netsim.engine_spec import DEFAULT_NETWORK, FLOW_FIELDS, NETWORKS
from phantora.netsim.packet_config import override_fields
from phantora.progress import auto_mode


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors name the first unknown `--option` before the positionals (the script
    and its own arguments are not looked at), with the nearest known option (difflib). Without this, a typo
    in a required option reads "required: --topology", and one among the options "unrecognized arguments"."""

    _argv: list[str] | None = None

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        self._argv = args
        if self.unknown_option() is not None:  # it would fail later (extras), or on a required option it hides
            self.error("unrecognized arguments")
        return super().parse_known_args(args, namespace)

    def unknown_option(self) -> str | None:
        """The first `--name` among this parser's own options (up to the first positional) that is neither
        one of them nor a prefix of one; None if there is none, or the arguments were not seen."""
        argv = self._argv or []
        i = 0
        while i < len(argv):
            tok = argv[i]
            if tok == "--" or not tok.startswith("-") or tok == "-":
                return None
            name = tok.split("=", 1)[0]
            action = self._option_string_actions.get(name[:2] if not tok.startswith("--") else name)
            if action is None and tok.startswith("--"):
                known = [o for o in self._option_string_actions if o.startswith(name)]
                if not known:
                    return name
                action = self._option_string_actions[known[0]]
            takes = action is not None and action.nargs in (None, 1)  # the next token is its value
            attached = "=" in tok or (not tok.startswith("--") and len(tok) > 2)
            i += 2 if takes and not attached else 1
        return None

    def error(self, message: str) -> NoReturn:
        name = self.unknown_option()
        if name is not None:
            longs = [o for o in self._option_string_actions if o.startswith("--")]
            near = difflib.get_close_matches(name, longs, n=1)
            message = f"unknown option {name}" + (f"; did you mean {near[0]}?" if near else "")
        super().error(message)


def set_help(sweep: bool = False) -> str:
    """The --set help: every PacketConfig field, the CCs' own attributes, what the flow network takes."""
    what = "FIELD=V1,V2 sweeps a PacketConfig field" if sweep else "a PacketConfig field of the ns3 network"
    return (
        f"{what}, repeatable (docs/packet-model.md). Fields: {', '.join(override_fields())}; and cc.ATTRIBUTE, "
        f"any attribute of the chosen CC (`phantora cc NAME` lists them). The flow network takes "
        f"{', '.join(FLOW_FIELDS)} only"
    )


def _listed(name: str, known: Sequence[str]) -> Callable[[str], str]:
    """An argparse type: a comma-separated list whose every item is one of `known` (sweep axes)."""

    def check(text: str) -> str:
        for item in text.split(","):
            if item.strip() not in known:
                raise argparse.ArgumentTypeError(f"{name} {item.strip()!r}: choose from {', '.join(known)}")
        return text

    check.__name__ = name  # argparse names the option's type in its error
    return check


def add_network_options(p: argparse.ArgumentParser, *, sweep: bool = False) -> None:
    """`--network`, `--cc` and `--set`; for `sweep`, each takes a comma-separated list to sweep."""
    if sweep:
        p.add_argument(
            "--network",
            type=_listed("network", NETWORKS),
            default=None,
            help=f"network engine(s): {' or '.join(NETWORKS)}, or flow,ns3 to sweep both (default: the grid's, "
            f"else {DEFAULT_NETWORK})",
        )
        p.add_argument(
            "--cc",
            default=None,
            help="congestion control(s) of the ns3 network, e.g. dcqcn,hpcc to sweep: registered names "
            "(`phantora cc` lists them)",
        )
    else:
        p.add_argument(
            "--network",
            choices=NETWORKS,
            default=DEFAULT_NETWORK,
            help=f"network engine: flow (max-min fair flows) or ns3 (packets) (default: {DEFAULT_NETWORK})",
        )
        p.add_argument(
            "--cc",
            default=None,
            metavar="NAME",
            help="congestion control of the ns3 network: a registered name, built in or from $PHANTORA_CC_DIR "
            "(`phantora cc` lists them; default: none)",
        )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=set_help(sweep))


def add_progress_options(p: argparse.ArgumentParser, quiet_also: str = "") -> None:
    """`--progress/--no-progress` and `--quiet` (`quiet_also`: what else --quiet leaves out)."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress: a live bar (default on a terminal; otherwise a plain line every few seconds)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help=f"print no progress{quiet_also}")


def add_granularity_option(p: argparse.ArgumentParser, default: str | None = "coarse") -> None:
    """`--granularity`: the flows a collective makes (`AlgoOptions.granularity`). `default` None: not given
    (replay: the input's own options decide, else coarse)."""
    from phantora.collectives.spec import GRANULARITIES  # phantora.collectives loads the decomposition

    p.add_argument(
        "--granularity",
        choices=GRANULARITIES,
        default=default,
        help="the collectives' flows: coarse (default: one per connection and algorithm step) or chunked (NCCL's "
        "passes, steps and chunks, each a message: the bursts a packet run sees; many more flows)",
    )


PLOT_STYLES = ("default", "paper")  # phantora.report.plots.PLOT_STYLES (not imported here: matplotlib is slow)


def add_plot_options(p: argparse.ArgumentParser) -> None:
    """`--no-plots` and `--plot-style`."""
    p.add_argument("--no-plots", dest="plots", action="store_false", help="skip the plots")
    p.add_argument(
        "--plot-style",
        choices=PLOT_STYLES,
        default="default",
        help="plot style: default, or paper (one column wide, 3.5 in, 8 pt text, 300 dpi)",
    )


def progress_mode(args: argparse.Namespace) -> str:
    """'off' (--quiet, --no-progress), 'bar' (--progress, or a terminal) or 'lines' (a log file or a pipe)."""
    return auto_mode(args.progress, args.quiet)
