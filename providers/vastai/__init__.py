"""Vast.ai: the REST API client and the offer/instance mapping behind the provider interface."""
