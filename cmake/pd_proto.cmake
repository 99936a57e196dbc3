# Protocol buffers and gRPC code generation.
#
# Debian's gRPC ships no complete CMake config, so protoc and grpc_cpp_plugin are found as
# programs and the libraries through pkg-config (grpc++_reflection has no .pc: found by name).
#
#   pd_proto_library(NAME pd_proto ROOT ${CMAKE_CURRENT_SOURCE_DIR}
#                    PROTOS pdserve/v1/chat.proto [GRPC])
#
# generates <build>/proto_gen/<path>.pb.{h,cc} (and .grpc.pb.{h,cc} with GRPC) for each proto,
# given relative to ROOT (which is also the import path), and builds them into library NAME.
# Sources include them as "pdserve/v1/chat.pb.h".

find_program(PD_PROTOC protoc REQUIRED)
find_program(PD_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
pkg_check_modules(PD_GRPCPP REQUIRED IMPORTED_TARGET grpc++ grpc protobuf)
find_library(PD_GRPCPP_REFLECTION grpc++_reflection REQUIRED)

set(PD_PROTO_GEN_DIR ${CMAKE_BINARY_DIR}/proto_gen)

function(pd_proto_library)
  cmake_parse_arguments(PD "GRPC" "NAME;ROOT" "PROTOS" ${ARGN})
  set(srcs)
  foreach(proto ${PD_PROTOS})
    string(REGEX REPLACE "\\.proto$" "" stem ${proto})
    set(outs ${PD_PROTO_GEN_DIR}/${stem}.pb.h ${PD_PROTO_GEN_DIR}/${stem}.pb.cc)
    set(args --cpp_out=${PD_PROTO_GEN_DIR})
    if(PD_GRPC)
      list(APPEND outs ${PD_PROTO_GEN_DIR}/${stem}.grpc.pb.h ${PD_PROTO_GEN_DIR}/${stem}.grpc.pb.cc)
      list(APPEND args --grpc_out=${PD_PROTO_GEN_DIR}
                       --plugin=protoc-gen-grpc=${PD_GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
      OUTPUT ${outs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PD_PROTO_GEN_DIR}
      COMMAND ${PD_PROTOC} -I ${PD_ROOT} ${args} ${PD_ROOT}/${proto}
      DEPENDS ${PD_ROOT}/${proto} ${PD_PROTOC} ${PD_GRPC_CPP_PLUGIN}
      COMMENT "protoc ${proto}"
      VERBATIM)
    list(FILTER outs INCLUDE REGEX "\\.cc$")
    list(APPEND srcs ${outs})
  endforeach()
  add_library(${PD_NAME} STATIC ${srcs})
  target_include_directories(${PD_NAME} PUBLIC ${PD_PROTO_GEN_DIR})
  target_link_libraries(${PD_NAME} PUBLIC PkgConfig::PD_GRPCPP)
  # Generated code is not ours to warn about.
  target_compile_options(${PD_NAME} PRIVATE -w)
  set_target_properties(${PD_NAME} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
