"""The disaggregated runtime: target inference on capture servers, training on trainer ranks.

Capture servers turn prompts into target features and write them into a feature store; a
producer leases prompts to them, plans optimizer windows and publishes tensor-free sample
references; trainer ranks fetch whole windows, train and acknowledge. One sub-package per part:
`wire` (the JSON contract between them), `store` (feature stores and tensor I/O), `capture`
(capture servers and clients, SGLang), `producer` (leasing, ledger, backpressure, windows, the
window controller; `python -m specdraft.trainer.disagg.producer`), `consumer` (the trainer ranks'
side) and `managed` (one machine runs every service under a supervisor). Import from the
sub-package that owns a name; SGLang and Mooncake are optional extras, imported only when used.
"""
