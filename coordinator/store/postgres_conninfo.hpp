#pragma once
// What is said about a PostgreSQL connection string, for every module that
// opens one (the store, and the secrets replicas share: coordinator/shared):
// a conninfo may hold a password, and none of these lets it out.
#include <libpq-fe.h>

#include <string>

#include "common/error.hpp"

namespace factory::store {

// The conninfo's password ("" when none): whatever is said about the
// database has it taken out.
std::string password_of(const std::string& conninfo);
// `text` with every occurrence of `secret` replaced by "***".
std::string scrub(std::string text, const std::string& secret);
// Where the database is, for messages: "postgres host=… port=… dbname=…
// user=…", nothing else of the conninfo (a password, a key file's
// passphrase). invalid_argument, without repeating it, when it does not parse.
Result<std::string> describe_conninfo(const std::string& conninfo);
// The first line of libpq's message ("no message" when it is empty).
std::string first_line(const char* msg);

// A connection as every one of Factory's is opened: libpq's defaults first
// (the conninfo, expanded from "dbname", overrides them), keepalives so that
// a database gone without a word (a node lost) is noticed in about half a
// minute rather than at the kernel's two hours, `app` as its
// application_name, and the server's notices (NOTICE: relation already
// exists) not printed. Errors are said as "<who>: cannot connect to
// <where>: ...", with `secret` (the password) taken out.
Result<PGconn*> open_connection(const std::string& conninfo, const char* app,
                                const std::string& who, const std::string& where,
                                const std::string& secret);

}  // namespace factory::store
