"""What Kiln keeps in Redis to secure its listeners: credentials now; ACLs and quotas later
(docs/security-design.md §4.3)."""
