"""Descriptor of the ``lambda`` actor backend (AWS Lambda, or the local Invoke endpoint)."""

from __future__ import annotations

from typing import Any

from kernel.registry import Plugin
from kernel.schema import Field, PlanError

LAMBDA_CONFIG = {
    "function": Field("str", "nitro-actor", "Function name (or ARN) to invoke."),
    "region": Field("str", None, "AWS Region of the function (default: AWS_REGION or the "
                    "profile's Region, else us-east-1)."),
    "endpoint_url": Field("str", None, "Invoke endpoint, e.g. http://127.0.0.1:9001 for "
                          "'python -m kernel lambda serve' (default: AWS)."),
    "invocation": Field("str", "request_response", "Invocation type.",
                        choices=("request_response", "event")),
    "concurrency": Field("int", 64, "Invocations in flight at once from this learner.", min=1,
                         max=10000),
    "memory_mb": Field("int", 1769, "Function memory (what the cost model bills).", min=128,
                       max=10240),
    "timeout_s": Field("float", 300.0, "Function timeout; the SDK read timeout sits above it.",
                       min=1, max=900),
    "invoke_deadline_s": Field("float", None, "Per-invocation deadline including retries "
                               "(default: actors.deadline_s).", min=0, min_exclusive=True),
    "max_retries": Field("int", 8, "Retries of a throttled (429) or 5xx invoke.", min=0,
                         max=100),
    "backoff_s": Field("float", 0.1, "First backoff step (full jitter, doubling).", min=0),
    "backoff_max_s": Field("float", 5.0, "Longest backoff step.", min=0),
    "duplicate_fraction": Field("float", 0.0, "Fault injection: share of Event invocations "
                                "sent twice, as Lambda may deliver them.", min=0, max=1),
}


def validate(section: dict[str, Any], plan: dict[str, Any]) -> None:
    """Functions cannot hand a batch back through the invoke reply: they need a transport they
    reach over the network."""
    kind = plan.get("transport", {}).get("kind")
    if kind == "memory":
        raise PlanError(
            "transport.kind", "a networked transport such as 'redis' for actors.backend "
            "'lambda'", kind,
            note="Lambda functions cannot reach the learner's in-memory transport; add "
                 "[transport] kind = \"redis\" with a url the functions can reach",
        )


PLUGINS = [
    Plugin("lambda", "actors", "plugins.actors.aws_lambda:LambdaBackend",
           "AWS Lambda (or the local Invoke endpoint) through aiobotocore.",
           config=LAMBDA_CONFIG, validator="plugins.descriptors.aws_lambda:validate"),
]
