"""Adapters: the ports in ``sluice.ports`` over boto3 clients (passed in) or in memory."""
