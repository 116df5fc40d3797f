"""Record the dashboard's telemetry from the demo engine under traffic; draw the docs' screenshots.

    python tools/dashboard_record.py --record tests/dashboard/recorded.json --svg docs/img

Loads the embedded demo core in this process, serves it, sends a few streamed chat requests
(two with long prompts, so prefill shows beside decode; one short, so a retired row shows),
and feeds a dashboard state the way the running dashboard does, four times a second. Halfway
through the traffic it writes the state (flare/dashboard/record.py) and, with ``--svg``, an
SVG of each pane at 120 columns (rich's export).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from rich.console import Console  # noqa: E402

from flare.config import EngineConfig, ServerConfig  # noqa: E402
from flare.core.embedded import demo_core  # noqa: E402
from flare.dashboard.app import Dashboard  # noqa: E402
from flare.dashboard.record import to_json  # noqa: E402
from flare.dashboard.render import PANES, View, frame  # noqa: E402
from flare.engine.native import NativeEngine  # noqa: E402
from flare.server.session import Server  # noqa: E402

PROMPTS = [
    ("Write a long story about a lighthouse keeper. " * 30, 40),
    ("Count from one to forty in words.", 120),
    ("Name the capital of France.", 12),
    ("List ten colours.", 80),
    ("Explain what a prefix cache is. " * 20, 60),
    ("Say hello.", 100),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, help="write the recorded state (JSON) here")
    parser.add_argument("--svg", type=Path, help="write dashboard-overview.svg and dashboard-scheduler.svg here")
    parser.add_argument("--at", type=float, default=5.0, help="seconds into the traffic to record")
    args = parser.parse_args()
    config = ServerConfig(port=0, engine=EngineConfig(kv_memory_bytes=512 << 20))
    engine = NativeEngine.load(demo_core(print), config)
    with Server.start(engine, config) as session:
        dashboard = Dashboard(engine, title=f"Flare \u00b7 {engine.card.identifier} \u00b7 {session.base_url}")
        dashboard.trace = engine.start_trace()

        def send(prompt: str, max_tokens: int, delay: float) -> None:
            time.sleep(delay)
            body = {"model": engine.card.identifier, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "stream": True, "temperature": 0}
            with httpx.stream("POST", session.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
                r.raise_for_status()
                for _ in r.iter_lines():
                    pass

        threads = [threading.Thread(target=send, args=(p, n, 0.3 * i)) for i, (p, n) in enumerate(PROMPTS)]
        for t in threads:
            t.start()
        started = time.monotonic()
        recorded = None
        while any(t.is_alive() for t in threads):
            now = time.monotonic_ns()
            dashboard.tick(now)
            if recorded is None and time.monotonic() - started >= args.at:
                recorded = now
                data = to_json(dashboard.state, now)
                if args.record:
                    args.record.parent.mkdir(parents=True, exist_ok=True)
                    args.record.write_text(json.dumps(data, indent=1) + "\n")
                    print(f"recorded {len(data['completions'])} completions, "
                          f"{len(data['sample']['requests']) if data['sample'] else 0} sampled requests "
                          f"to {args.record}")
                if args.svg:
                    args.svg.mkdir(parents=True, exist_ok=True)
                    for pane in PANES:
                        console = Console(record=True, width=120, file=open("/dev/null", "w"), force_terminal=True)
                        console.print(frame(dashboard.state, now, View(pane=pane, width=120, height=30,
                                                                       title=dashboard.title)))
                        path = args.svg / f"dashboard-{pane}.svg"
                        path.write_text(console.export_svg(title=f"flare-serve: {pane} pane"))
                        print(f"wrote {path}")
            time.sleep(0.25)
        for t in threads:
            t.join()
        engine.stop_trace()
    return 0


if __name__ == "__main__":
    sys.exit(main())
