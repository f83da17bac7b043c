module tide.dev/tide

go 1.19
