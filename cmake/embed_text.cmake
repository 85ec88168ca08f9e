# Writes a C++ file defining `const char <SYMBOL>[]` with the text of IN, so a
# data file (the built-in catalog) is compiled into the binaries and can never
# be missing or out of step with them at run time.
#   cmake -DIN=file -DOUT=file.cpp -DNAMESPACE=ns -DSYMBOL=name -P embed_text.cmake
file(READ "${IN}" text)
set(delim "factory_embed")
string(FIND "${text}" ")${delim}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )${delim}\"")
endif()
set(content "// Generated from ${IN} by cmake/embed_text.cmake. Do not edit.\n")
string(APPEND content "namespace ${NAMESPACE} {\n")
string(APPEND content "extern const char ${SYMBOL}[];\n")
string(APPEND content "const char ${SYMBOL}[] = R\"${delim}(${text})${delim}\";\n")
string(APPEND content "}  // namespace ${NAMESPACE}\n")
# Rewrite only on change so dependants are not rebuilt for nothing.
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
  if(old STREQUAL content)
    return()
  endif()
endif()
file(WRITE "${OUT}" "${content}")
