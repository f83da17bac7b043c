# tide_warnings: the warning set every first-party target uses.
add_library(tide_warnings INTERFACE)
target_compile_options(tide_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
if(TIDE_WERROR)
  target_compile_options(tide_warnings INTERFACE -Werror)
endif()
