"""`specdraft curves`: a run's held-out tau against optimizer step and training time.

`read.py` turns a run's metrics.jsonl into a `Curve` (one point per evaluation), `summary.py`
the numbers a curve is judged by (first, last, best tau; the time a tau is first reached),
`table.py` the text and JSON reports, `plot.py` the PNG. No module here imports torch, so the
command starts fast. Import from the modules.
"""
