"""The Textual dashboard: state model, panels, command table, themes (imports `pdtop.telemetry`, never the reverse).

`pdtop.ui.state`, `pdtop.ui.keymap` and `pdtop.ui.live_tune` import no Textual; `pdtop.ui.app.PdtopApp` is the app.
"""
