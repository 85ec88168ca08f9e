# One CMake target per module, and the build enforces which module may use
# which (docs/architecture.md, "Module graph").
#
#   factory_module(<target> DIR <folder> [PUBLIC <modules>...] [PRIVATE <modules>...]
#                  [SOURCES <extra files>...] [EXTERNAL <non-module libraries>...])
#
# How the boundary is built, not hoped for: no directory of the source tree is
# on any include path. Each module gets its own include root under
# <build>/modinc/<target>/ holding a symbolic link per header of its folder
# (`agent/plan/engine.hpp` -> the real file), and a target sees only the
# include roots of itself and of the modules it links (PUBLIC ones pass on to
# whoever links it). A module that includes a header of a module it does not
# name fails to compile with "No such file or directory".
#
# Every module is recorded (global property FACTORY_MODULES, with its folder
# and its direct dependencies), and factory_write_module_graph() writes them
# to <build>/module_graph.json for the graph test (tests/architecture/).

define_property(GLOBAL PROPERTY FACTORY_MODULES
  BRIEF_DOCS "Factory's module targets" FULL_DOCS "Every target made by factory_module().")

function(factory_module target)
  cmake_parse_arguments(M "" "DIR" "PUBLIC;PRIVATE;SOURCES;EXTERNAL" ${ARGN})
  if(NOT M_DIR)
    message(FATAL_ERROR "factory_module(${target}): DIR is required")
  endif()
  set(src_dir ${CMAKE_SOURCE_DIR}/${M_DIR})
  file(GLOB sources CONFIGURE_DEPENDS ${src_dir}/*.cpp)
  # A folder's main.cpp is a binary's entry point (coordinator/cli/main.cpp):
  # the executable compiles it, linking the module; the module does not hold it.
  list(FILTER sources EXCLUDE REGEX "/main\\.cpp$")
  file(GLOB headers CONFIGURE_DEPENDS ${src_dir}/*.hpp)
  list(APPEND sources ${M_SOURCES})

  # The module's include root: one link per header, so a sub-folder that is a
  # module of its own (common/net) is not reachable through its parent.
  set(inc_root ${CMAKE_BINARY_DIR}/modinc/${target})
  file(REMOVE_RECURSE ${inc_root})
  file(MAKE_DIRECTORY ${inc_root}/${M_DIR})
  foreach(h ${headers})
    get_filename_component(hname ${h} NAME)
    file(CREATE_LINK ${h} ${inc_root}/${M_DIR}/${hname} SYMBOLIC)
  endforeach()

  if(sources)
    add_library(${target} STATIC ${sources})
    target_include_directories(${target} PUBLIC ${inc_root})
    target_link_libraries(${target} PUBLIC ${M_PUBLIC} PRIVATE ${M_PRIVATE} ${M_EXTERNAL})
    factory_pch(${target})
    if(FACTORY_UNITY)
      # The files of a batch share one translation unit: no two of a module's
      # sources may define the same name in an anonymous namespace (or as a
      # static), nor leave a using-directive behind for the next file.
      set_target_properties(${target} PROPERTIES
        UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${FACTORY_UNITY_BATCH_SIZE})
    endif()
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${inc_root})
    if(M_PRIVATE)
      message(FATAL_ERROR "factory_module(${target}): a header-only module has no PRIVATE dependencies")
    endif()
    target_link_libraries(${target} INTERFACE ${M_PUBLIC} ${M_EXTERNAL})
  endif()

  set_property(GLOBAL APPEND PROPERTY FACTORY_MODULES ${target})
  set_property(GLOBAL PROPERTY FACTORY_MODULE_DIR_${target} ${M_DIR})
  set_property(GLOBAL PROPERTY FACTORY_MODULE_PUBLIC_${target} "${M_PUBLIC}")
  set_property(GLOBAL PROPERTY FACTORY_MODULE_PRIVATE_${target} "${M_PRIVATE}")
endfunction()

# <build>/module_graph.json: {"modules": {target: {"dir", "public": [...], "private": [...]}}}
function(factory_write_module_graph)
  get_property(mods GLOBAL PROPERTY FACTORY_MODULES)
  set(json "{\n  \"modules\": {\n")
  set(first TRUE)
  foreach(m ${mods})
    get_property(dir GLOBAL PROPERTY FACTORY_MODULE_DIR_${m})
    get_property(pub GLOBAL PROPERTY FACTORY_MODULE_PUBLIC_${m})
    get_property(priv GLOBAL PROPERTY FACTORY_MODULE_PRIVATE_${m})
    set(pub_json "")
    foreach(d ${pub})
      if(pub_json)
        string(APPEND pub_json ", ")
      endif()
      string(APPEND pub_json "\"${d}\"")
    endforeach()
    set(priv_json "")
    foreach(d ${priv})
      if(priv_json)
        string(APPEND priv_json ", ")
      endif()
      string(APPEND priv_json "\"${d}\"")
    endforeach()
    if(NOT first)
      string(APPEND json ",\n")
    endif()
    set(first FALSE)
    string(APPEND json "    \"${m}\": {\"dir\": \"${dir}\", \"public\": [${pub_json}], \"private\": [${priv_json}]}")
  endforeach()
  string(APPEND json "\n  }\n}\n")
  file(WRITE ${CMAKE_BINARY_DIR}/module_graph.json "${json}")
endfunction()
