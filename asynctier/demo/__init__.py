"""The demo: four workloads modelled on the seeds, run end to end by ``asynctier demo``.

Three read Kafka topics: a media upload that encodes several resolutions (normal tier), a
live-stream notification (urgent: useless if late) and friend suggestions (batch: useless
only if never). Some uploads fail for a while and recover through the delay topics; a few
never recover and land in the dead-letter topic.

One reads a queue topic (:mod:`asynctier.demo.transcode`): whole-video transcodes that
take a while, enqueued with three priorities at once; the highest start first.
"""
