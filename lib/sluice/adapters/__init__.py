"""Adapters: the ports in ``sluice.core.ports`` over boto3 clients (passed in) or in memory."""
