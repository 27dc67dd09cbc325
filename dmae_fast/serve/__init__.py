"""``dmae-serve``: a smoothed classifier as an HTTP service with continuous batching (docs/serving.md).

* :mod:`.config`: :class:`ServeConfig`, request :class:`Limits` and :class:`Defaults`;
* :mod:`.scheduler`: the device thread packing the samples of all in-flight requests into batches;
* (procedures: :mod:`dmae_fast.stats.procedure`, shared with dmae-certify);
* :mod:`.payloads`: request decoding and validation; :mod:`.app`: the HTTP routes;
* :mod:`.service`, :mod:`.server`: the service object and the uvicorn process;
* :mod:`.receipt`: re-running an answer offline from its receipt.
"""
