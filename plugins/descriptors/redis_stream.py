"""Descriptor of the Redis transport (weights by key, batches on a stream + consumer group)."""

from __future__ import annotations

from kernel.registry import Plugin
from kernel.schema import Field

REDIS_CONFIG = {
    "url": Field("str", doc="redis://[user[:password]@]host:port/db, rediss:// (TLS) or "
                            "unix://; the password may come from NITRO_REDIS_PASSWORD instead."),
    "keep_versions": Field("int", 3, "Newest weight versions kept; an older one is deleted "
                           "when a newer one is published.", min=1),
    "weights_ttl_s": Field("float", 86_400.0, "Expiry of the kept versions (a crashed run does "
                           "not leak forever; 0: never).", min=0),
    "stream_ttl_s": Field("float", 3600.0, "Expiry of the batch stream and its consumer group, "
                          "refreshed while the run lives.", min=1),
    "stream_maxlen": Field("int", 10_000, "Approximate cap on the batch stream (XADD MAXLEN ~); "
                           "used entries are deleted on acknowledgement anyway.", min=100),
    "block_ms": Field("int", 1000, "Longest single blocking XREADGROUP.", min=1, max=60_000),
    "read_count": Field("int", 16, "Entries fetched per XREADGROUP.", min=1, max=10_000),
    "group": Field("str", "learners", "Consumer group of the batch stream."),
    "consumer": Field("str", "learner", "Consumer name; keep it across restarts so pending "
                      "batches are re-read."),
    "socket_timeout_s": Field("float", 10.0, "Socket read timeout (above block_ms).", min=0,
                              min_exclusive=True),
    "connect_timeout_s": Field("float", 5.0, "Socket connect timeout.", min=0,
                               min_exclusive=True),
    "reconnect_s": Field("float", 60.0, "How long the learner keeps reconnecting before the "
                         "run fails.", min=0, min_exclusive=True),
    "weights_wait_s": Field("float", 5.0, "How long an actor waits for a missing weights "
                            "version (republished after a Redis restart) before failing.",
                            min=0),
    "ssl_ca_certs": Field("str", None, "CA bundle for rediss:// (the learner's; actors read "
                          "NITRO_REDIS_SSL_CA_CERTS from their environment)."),
    "ssl_cert_reqs": Field("str", None, "Certificate check for rediss:// (unset: required).",
                           choices=("none", "optional", "required")),
    "ssl_check_hostname": Field("bool", True, "Check that the server certificate names the "
                                "host (off when ssl_cert_reqs is none)."),
}

PLUGINS = [
    Plugin("redis", "transport", "plugins.transports.redis_stream:RedisTransport",
           "Redis: weights per version by key, batches on a stream read by a consumer group.",
           config=REDIS_CONFIG, validator="plugins.transports.redis_stream:validate"),
]
