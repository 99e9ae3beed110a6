"""web: Jinja2 templates and static assets for the form, hosts, jobs and evidence pages;
served by api; imports nothing."""
