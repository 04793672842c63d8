"""The model's load as the client sees it: `$/progress` (work done progress) from the first report
to the load's end, where the client supports server-initiated progress.

Knows pygls' progress API and a load's `Ticket`; nothing of the model.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from ..runtime.worker import Ticket


class LoadProgress:
    def __init__(self, server: LanguageServer, log: Callable[[str], None], state: Callable[[], str]):
        self.server, self.log = server, log
        self.state = state  # how a load ended, as the status says it (the progress' end message)
        self.ticket: Ticket | None = None  # the load under way (or done)
        self.message = "starting"  # its last report
        self._token: str | None = None

    def report(self, message: str, percent: int) -> None:
        """A load's report (on the loop): kept for the progress' begin, sent if one is shown."""
        self.message = message
        if self._token is not None:
            report = types.WorkDoneProgressReport(message=message, percentage=percent)
            self.server.work_done_progress.report(self._token, report)

    async def show(self) -> None:
        """$/progress while the load runs; `state()` names how it ended (the progress' end message)."""
        ticket, server = self.ticket, self.server
        window = server.client_capabilities.window
        if ticket is None or not (window and window.work_done_progress):
            return
        token = f"llada-load-{uuid.uuid4()}"
        try:
            await server.work_done_progress.create_async(token)
        except Exception as err:  # the client refused the token: no progress bar, nothing else changes
            self.log(f"no progress bar for loading: {err}")
            return
        self._token = token
        begin = types.WorkDoneProgressBegin(title="llada: loading the model", message=self.message, percentage=0)
        server.work_done_progress.begin(token, begin)
        await asyncio.wait([asyncio.wrap_future(ticket.future)])
        self._token = None
        server.work_done_progress.end(token, types.WorkDoneProgressEnd(message=self.state()))
