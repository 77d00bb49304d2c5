module benchmod

go 1.26
