"""The actor function and its tooling: the Lambda ``handler`` that runs in AWS, in the local
worker pool and behind the local Invoke endpoint; the contract the backends share with it; and
the ``nitro lambda`` command (serve the endpoint, deploy the function).

``actor_contract`` is stdlib only: the endpoint's worker processes re-import their parent's main
module, so nothing heavy may be imported from this package's ``__init__``.
"""
