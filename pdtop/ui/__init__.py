"""The Textual dashboard: state model, panels, command table, themes (imports `pdtop.telemetry`, never the reverse).

`pdtop.ui.state` and `pdtop.ui.commands` import no Textual; `pdtop.ui.app.PdtopApp` is the app.
"""
