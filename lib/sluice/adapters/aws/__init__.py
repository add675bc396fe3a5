"""Step Functions, SQS, SSM, S3 and CloudWatch behind Sluice's ports."""
