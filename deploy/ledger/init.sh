#!/bin/sh
# Once, as the ledger's administrator (the ledger-admin service of
# deploy/docker-compose.ledger.yml, or by hand with the same variables): create the two
# roles with the passwords of their libpq password files, the database's ownership, and
# the ledger's schema with the operator's grants (`dpdask ledger init --operator-role`).
#   PGHOST, PGDATABASE, PGSSLMODE, PGSSLROOTCERT  where the server is, and how TLS is checked
#   POSTGRES_PASSWORD_FILE                        the superuser's password (roles, ownership)
#   POSTGRES_USER                                 the superuser (default postgres)
#   PGPASSFILE                                    the administrator's password file
#   DPDASK_OPERATOR_PASSFILE                      the operator's password file
set -eu
: "${PGHOST:?}" "${PGDATABASE:?}" "${POSTGRES_PASSWORD_FILE:?}" "${PGPASSFILE:?}"
: "${DPDASK_OPERATOR_PASSFILE:?}"
password() { cut -d: -f5- "$1"; }
role() { cut -d: -f4 "$1"; }
ADMIN=$(role "$PGPASSFILE")
OPERATOR=$(role "$DPDASK_OPERATOR_PASSFILE")
# the superuser creates the roles; the passwords reach psql in its environment (owner-
# only in /proc), never on a command line
DPDASK_ADMIN_PW=$(password "$PGPASSFILE") DPDASK_OPERATOR_PW=$(password "$DPDASK_OPERATOR_PASSFILE") \
PGPASSWORD=$(cat "$POSTGRES_PASSWORD_FILE") PGPASSFILE=/dev/null psql -q -v ON_ERROR_STOP=1 \
    -U "${POSTGRES_USER:-postgres}" -d "$PGDATABASE" -v admin="$ADMIN" -v operator="$OPERATOR" \
    <<'SQL'
\getenv admin_pw DPDASK_ADMIN_PW
\getenv operator_pw DPDASK_OPERATOR_PW
SELECT format('CREATE ROLE %I LOGIN', :'admin')
    WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'admin') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'operator')
    WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'operator') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'admin', :'admin_pw') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'operator', :'operator_pw') \gexec
SELECT format('ALTER DATABASE %I OWNER TO %I', current_database(), :'admin') \gexec
SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()) \gexec
REVOKE ALL ON SCHEMA public FROM PUBLIC;
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'operator') \gexec
SQL
# the administrator creates the ledger: the operator may then only read and append
exec dpdask ledger init "postgresql://$ADMIN@$PGHOST/$PGDATABASE" --operator-role "$OPERATOR"
