"""pages: the HTML pages (job form, login, hosts, job progress, evidence) rendering `web/`.

Routes stay thin: they call the same service functions as the JSON API. Browser identity is a
signed session cookie issued after a submitter API key is checked once at /login; every form
POST carries a signed double-submit CSRF token.
"""
