"""The Textual cockpit: one screen per file (launch, editor, dashboard, runs, help, quit),
widgets in widgets/, and the parts with no Textual in them (model, follow, probe) beside them."""
