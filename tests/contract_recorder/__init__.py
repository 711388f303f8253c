"""Contract evidence without a cluster: every exchange of qosflow's client, checked.

A pytest plugin (:mod:`contract_recorder.plugin`, loaded by ``tests/conftest.py``) records every
HTTP exchange qosflow's client code makes with the Argo Server and the Kubernetes API during the
test session (:mod:`~contract_recorder.recorder`), makes the JSON the client parses record the
fields it reads (:mod:`~contract_recorder.tracking`), and checks requests, responses and reads
against ``swagger.json``, the Argo ``schema.json`` and the Kubernetes OpenAPI schemas
(:mod:`~contract_recorder.validate`, the endpoint table in :mod:`~contract_recorder.endpoints`).
"""
