"""The Textual app's placeholder screen, driven headless by Pilot."""

from __future__ import annotations

import asyncio

from cockpit.app import make_app


def test_welcome_screen_lists_presets_and_quits(home):
    async def drive():
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            text = str(app.query_one("#welcome").render())
            assert "cockpit --no-ui" in text and "mps-safe" in text and "matmul" in text
            await pilot.press("q")
        return app.return_code

    assert asyncio.run(drive()) in (0, None)
