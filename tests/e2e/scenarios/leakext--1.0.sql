-- leakext--1.0.sql: SQL definitions of the leakext test extension (see leakext.c).
-- Not installed into the system's extension directory: the tests run this file's
-- statements directly, with MODULE_PATHNAME replaced by the absolute path of the
-- leakext.so they built (PostgreSQL 15 has no extension_control_path).
\echo Use "CREATE EXTENSION leakext" to load this file. \quit
CREATE FUNCTION leak_top(n integer) RETURNS void
AS 'MODULE_PATHNAME', 'leak_top'
LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION leak_blocks(n integer, size integer) RETURNS void
AS 'MODULE_PATHNAME', 'leak_blocks'
LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION pool_fill(n integer, size integer, cap integer) RETURNS void
AS 'MODULE_PATHNAME', 'pool_fill'
LANGUAGE C STRICT VOLATILE;
