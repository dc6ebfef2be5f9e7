"""The SQL of a ledger on a PostgreSQL server (see :mod:`dpdask.privacy._pg`): its schema,
the trigger that refuses an insert not extending the hash chain, the append-only
guards, and the operator's grants and row-level policy."""

from __future__ import annotations

__all__ = ["GRANTS", "SCHEMA"]

SCHEMA = """
CREATE SCHEMA dpdask;
CREATE TABLE dpdask.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE dpdask.entries (
    seq bigint PRIMARY KEY,
    kind text NOT NULL,
    body text NOT NULL,
    prev text NOT NULL,
    hash text NOT NULL UNIQUE);
CREATE FUNCTION dpdask.digest(VARIADIC parts text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(sha256(string_agg(
        int8send(octet_length(convert_to(p, 'UTF8'))) || convert_to(p, 'UTF8'),
        ''::bytea ORDER BY i)), 'hex')
    FROM unnest(parts) WITH ORDINALITY AS t(p, i)
$$;
CREATE FUNCTION dpdask.extends_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE last_seq bigint; last_hash text; lid text;
BEGIN
    SELECT seq, hash INTO last_seq, last_hash FROM dpdask.entries ORDER BY seq DESC LIMIT 1;
    IF NOT FOUND THEN last_seq := 0; last_hash := repeat('0', 64); END IF;
    SELECT value INTO lid FROM dpdask.meta WHERE key = 'ledger';
    IF NEW.seq <> last_seq + 1 OR NEW.prev <> last_hash
       OR NEW.hash <> dpdask.digest(lid, NEW.seq::text, NEW.kind, NEW.body, NEW.prev) THEN
        RAISE EXCEPTION 'entry % does not extend the ledger''s hash chain', NEW.seq
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE FUNCTION dpdask.append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER entries_chain BEFORE INSERT ON dpdask.entries
    FOR EACH ROW EXECUTE FUNCTION dpdask.extends_chain();
CREATE TRIGGER entries_no_edit BEFORE UPDATE OR DELETE ON dpdask.entries
    FOR EACH ROW EXECUTE FUNCTION dpdask.append_only();
CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON dpdask.entries
    FOR EACH STATEMENT EXECUTE FUNCTION dpdask.append_only();
CREATE TRIGGER meta_no_edit BEFORE UPDATE OR DELETE ON dpdask.meta
    FOR EACH ROW EXECUTE FUNCTION dpdask.append_only();
CREATE FUNCTION dpdask.operator_may_insert(new_kind text, new_body text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE new_kind
        WHEN 'run' THEN true
        WHEN 'charge' THEN true
        WHEN 'state' THEN (new_body::jsonb ->> 'state') IN ('measuring', 'published')
        WHEN 'release' THEN EXISTS (
            SELECT 1 FROM dpdask.entries d WHERE d.kind = 'dataset'
            AND d.body::jsonb ->> 'dataset' = new_body::jsonb ->> 'dataset')
        WHEN 'source' THEN EXISTS (
            SELECT 1 FROM dpdask.entries d WHERE d.kind = 'dataset'
            AND d.body::jsonb ->> 'dataset' = new_body::jsonb ->> 'dataset')
          AND NOT EXISTS (
            SELECT 1 FROM dpdask.entries s WHERE s.kind = 'source'
            AND (s.body::jsonb ->> 'dataset' = new_body::jsonb ->> 'dataset'
                 OR s.body::jsonb ->> 'fingerprint' = new_body::jsonb ->> 'fingerprint'))
        ELSE false END
$$;
ALTER TABLE dpdask.entries ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON SCHEMA dpdask FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA dpdask FROM PUBLIC;
"""

GRANTS = """
GRANT USAGE ON SCHEMA dpdask TO {role};
GRANT SELECT ON dpdask.meta TO {role};
GRANT SELECT, INSERT ON dpdask.entries TO {role};
CREATE POLICY operator_reads ON dpdask.entries FOR SELECT TO {role} USING (true);
CREATE POLICY operator_appends ON dpdask.entries FOR INSERT TO {role}
    WITH CHECK (dpdask.operator_may_insert(kind, body));
"""
