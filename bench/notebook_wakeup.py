"""Why a notebook test sat idle for the whole cell timeout: a raw send on the shell socket takes the
wake-up of the reply that is waited for (``python -m bench notebook_wakeup``; tests/report/test_notebooks.py).

nbclient waits for a cell's ``execute_reply`` with one ``shell_channel.get_msg(timeout)``: an asyncio
poll of the DEALER socket's edge-triggered file descriptor. nbclient's stand-in for the ipywidgets
Output widget answers each output the widget captures with a ``comm_msg`` on the same shell channel,
and jupyter_client's ``Session.send`` writes it through a raw shadow of the asyncio socket. When the
reply arrives while the event loop is busy (decoding a large display_data) and such a send happens in
that window, the send consumes the wake-up: the reply sits in the socket until the poll's timeout,
whose last non-blocking poll finds it, so the cell passes after the whole timeout with the kernel idle.

This script does it on purpose with a kernel of this environment: a cell of 0.3 s, the event loop
blocked 1 s while the reply arrives, then (or not) one ``comm_msg`` sent as the stand-in sends it. It
records how long after the loop is free each reply is read. build_notebooks.client switches the
stand-in off, so headless runs never send there.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from _results import git_head, write_result

TRIALS = 5
POLL_TIMEOUT_S = 5.0


async def _trial(kc, send_comm_msg: bool) -> float:
    msg_id = kc.execute("import time; time.sleep(0.3)")
    poll = asyncio.ensure_future(kc.shell_channel.get_msg(timeout=POLL_TIMEOUT_S))
    await asyncio.sleep(0.05)  # the poll is registered and waiting
    time.sleep(1.0)  # the loop is busy; the reply arrives meanwhile
    if send_comm_msg:  # as nbclient's OutputWidget sends its state (Session.send: a raw shadow socket)
        kc.shell_channel.send(kc.session.msg("comm_msg", content={"comm_id": "none", "data": {}}))
    start = time.monotonic()
    reply = await poll
    while reply["parent_header"]["msg_id"] != msg_id:  # a late reply to wait_for_ready's kernel_info
        reply = await kc.shell_channel.get_msg(timeout=POLL_TIMEOUT_S)
    return time.monotonic() - start


async def _measure() -> dict:
    from jupyter_client import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        return {case: [round(await _trial(kc, send), 3) for _ in range(TRIALS)]
                for case, send in (("nothing_sent", False), ("comm_msg_sent", True))}
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


def main() -> None:
    import ipykernel
    import jupyter_client
    import nbclient
    import zmq

    waits = asyncio.run(_measure())
    write_result("notebook_wakeup", {
        "commit": git_head(Path(__file__).resolve().parents[1]),
        "versions": {"nbclient": nbclient.__version__, "jupyter_client": jupyter_client.__version__,
                     "ipykernel": ipykernel.__version__, "pyzmq": zmq.__version__},
        "poll_timeout_s": POLL_TIMEOUT_S,
        "seconds_until_the_reply_is_read": waits,
        "stranded": {case: sum(w > 1.0 for w in ws) for case, ws in waits.items()},
        "trials": TRIALS,
    })


if __name__ == "__main__":
    main()
