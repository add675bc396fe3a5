"""The DynamoDB store: one table, the protocol's conditions beside their races."""
