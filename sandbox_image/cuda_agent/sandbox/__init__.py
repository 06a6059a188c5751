"""The kernel sandbox: the judge (build -> verify -> profile -> milestone reward) and the session server.

This package ships in the sandbox image only; it imports torch lazily and never imports Kopf or Ray.
"""
