-- Docker Compose demo: run once by the postgres image, when it initialises its data volume.
-- The application's database, "app" (POSTGRES_DB), holds the outbox; OpenFGA keeps its own
-- datastore in a database of its own, owned by a role of its own.
-- Demo credentials only: they are fixed and public.
CREATE ROLE openfga LOGIN PASSWORD 'openfga';
CREATE DATABASE openfga OWNER openfga;
